"""Who is calling and what it may do: identities, the access policy, TLS, audit events.

Pure (values in, values out; import-linter keeps them free of grpc, clocks and env):
`principal` (identities, roles, permissions) and `policy` (the AccessPolicy file's model and
the one `authorize` function). Edge pieces that do I/O: `tls` (server credentials reloaded from
PEM files), `tokens` (bearer JWTs against a JWKS), `edge` (the gRPC interceptor that computes
the principal once per call), `audit` (structured audit events), `devcerts` (throwaway CAs).
"""
