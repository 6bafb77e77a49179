"""The sidecar's settings, by role: `schema` (the sections, each checking itself when
built), `nats` (how to connect, shared with the command line and the Spark source),
`loading` (a YAML file), `environment` (`RSUB_*` overrides), `secrets` (values that never
show), `checks` (what the sections share)."""
