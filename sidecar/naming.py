"""The naming contract of a virtual stream, as code.

For a virtual stream `V` and its regions, every stream name and subject the project uses is
derived here, so the topology manager, the sidecar runtime and the Spark plugin agree on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A stream or region name: one NATS subject token that is also a valid stream name.
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
TOKEN_PATTERN = f"^{_TOKEN.pattern}$"
"""A name (a region, a virtual stream, a subscription) as a JSON Schema pattern."""
MARKER_PREFIX = "_rsub"
SOURCE_HEADER = "Nats-Stream-Source"
# Default stream-name patterns over {name} and {region}: the sidecar config, the topology CLI
# and the Spark plugin all fall back to these, so they agree on stream names unless told.
DEFAULT_WRITE_STREAM = "{name}-write-{region}"
DEFAULT_READ_STREAM = "{name}-read-{region}"


class NamingError(ValueError):
    """A virtual stream definition breaks the naming contract; the message names the field."""


def check_token(field: str, value: object) -> str:
    """`value` if it is a valid stream, region or subscription name; NamingError naming `field`."""
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise NamingError(
            f"{field}: {value!r} is not a valid name (expected letters, digits, '_' or '-', "
            "starting with a letter or digit; no '.', '*', '>' or spaces)"
        )
    return value


def data_filter_of(name: str) -> str:
    """Filter that selects every data message (and no marker) of the virtual stream `name` in
    a read stream (for those that know only its name; `VirtualStream.data_filter`)."""
    return f"{name}.>"


@dataclass(frozen=True)
class VirtualStream:
    """A virtual stream `name` spread over `regions` (one write and one read stream each)."""

    name: str
    regions: tuple[str, ...]
    write_pattern: str = DEFAULT_WRITE_STREAM
    read_pattern: str = DEFAULT_READ_STREAM

    def __post_init__(self) -> None:
        check_token("name", self.name)
        if self.name.startswith("_"):
            raise NamingError(f"name: {self.name!r} must not start with '_'")
        regions = tuple(self.regions)
        object.__setattr__(self, "regions", regions)
        if not regions:
            raise NamingError(f"regions: virtual stream {self.name!r} needs at least one region")
        seen: set[str] = set()
        for region in regions:
            check_token("regions", region)
            if region in seen:
                raise NamingError(f"regions: region {region!r} is listed twice")
            seen.add(region)
        for field in ("write_pattern", "read_pattern"):
            pattern = getattr(self, field)
            if "{name}" not in pattern or "{region}" not in pattern:
                raise NamingError(f"{field}: {pattern!r} must contain {{name}} and {{region}}")
            for region in regions:
                try:
                    derived = pattern.format(name=self.name, region=region)
                except (KeyError, IndexError, ValueError) as exc:
                    raise NamingError(f"{field}: {pattern!r} is not a valid pattern") from exc
                check_token(field, derived)
        streams = [self.write_stream(r) for r in regions] + [self.read_stream(r) for r in regions]
        if len(set(streams)) != len(streams):
            raise NamingError(
                "read_pattern: write and read stream names collide "
                f"({self.write_pattern!r} vs {self.read_pattern!r})"
            )

    def _region(self, region: str) -> str:
        if region not in self.regions:
            raise NamingError(f"region: {region!r} is not a region of {self.name!r}")
        return region

    def write_stream(self, region: str) -> str:
        return self.write_pattern.format(name=self.name, region=self._region(region))

    def read_stream(self, region: str) -> str:
        return self.read_pattern.format(name=self.name, region=self._region(region))

    def data_subject(self, region: str) -> str:
        """Subjects of data published in `region` (captured by its write stream)."""
        return f"{self.name}.{self._region(region)}.>"

    def publish_subject(self, region: str, suffix: str) -> str:
        """Subject to publish data `suffix` (one or more tokens) in `region`."""
        tokens = suffix.split(".")
        if not suffix or any(not t or any(c in t for c in " *>\t\r\n") for t in tokens):
            raise NamingError(f"suffix: {suffix!r} is not a valid subject suffix")
        return f"{self.name}.{self._region(region)}.{suffix}"

    def marker_subject(self, region: str) -> str:
        """Replicated markers written by `region`'s sidecar to its write stream."""
        return f"{MARKER_PREFIX}.{self.name}.marker.{self._region(region)}"

    def snapshot_subject(self, region: str) -> str:
        """Completed snapshots written by `region`'s sidecar to its own read stream only."""
        return f"{MARKER_PREFIX}.{self.name}.snapshot.{self._region(region)}"

    def marker_filter(self) -> str:
        """Filter that selects every marker (replicated and snapshot) in a read stream."""
        return f"{MARKER_PREFIX}.{self.name}.>"

    def data_filter(self) -> str:
        """Filter that selects every data message (and no marker) in a read stream."""
        return data_filter_of(self.name)

    def region_of_write_stream(self, stream: str) -> str | None:
        """The region whose write stream is named `stream`, or None."""
        for region in self.regions:
            if self.write_stream(region) == stream:
                return region
        return None

    def origin_of(self, source_header: str) -> tuple[str, int] | None:
        """(origin region, sequence in its write stream) of a message in a read stream.

        `source_header` is the value of the `Nats-Stream-Source` header. On nats-server 2.10+
        it reads `<origin stream> <origin seq> <filters> <destinations> <original subject>
        [<identity>]`, filters and destinations joined by form feeds; the origin stream may
        carry a `:<hash>` suffix (a source in another domain). Returns None when the header
        does not come from one of this virtual stream's write streams.
        """
        fields = source_header.split(" ")
        if len(fields) < 2:
            return None
        region = self.region_of_write_stream(fields[0].split(":", 1)[0])
        if region is None or not fields[1].isdigit():
            return None
        seq = int(fields[1])
        return (region, seq) if seq > 0 else None


def region_in_stream(pattern: str, name: str, stream: str) -> str | None:
    """The region that `pattern` (over {name} and {region}) maps to `stream` for `name`, or None.

    Inverts a stream-name pattern, so a reader that only sees stream names (the Spark plugin
    reading a read stream's sources) finds the regions without knowing them in advance.
    """
    return _token_at_placeholder(pattern.format(name=name, region="\0"), stream)


def name_in_stream(pattern: str, region: str, stream: str) -> str | None:
    """The virtual-stream name that `pattern` maps to `stream` in `region`, or None.

    The other inversion of a stream-name pattern: stream discovery finds the virtual streams
    of an account from the names of its streams (`orders-read-west` -> `orders`).
    """
    return _token_at_placeholder(pattern.format(name="\0", region=region), stream)


def _token_at_placeholder(filled: str, stream: str) -> str | None:
    """The one name token that, put at every NUL of `filled`, spells `stream`; or None."""
    head, *rest = filled.split("\0")
    if not rest:
        return None
    regex = (
        re.escape(head) + f"(?P<token>{_TOKEN.pattern})" + "(?P=token)".join(map(re.escape, rest))
    )
    match = re.fullmatch(regex, stream)
    return match["token"] if match else None
