"""Infrastructure under every app: canonical JSON and digests, the error vocabulary, the
actor type, credential tokens, the read-only admin base, outbound HTTP, and the statement
a person signs with its passkey check. It imports no app."""
