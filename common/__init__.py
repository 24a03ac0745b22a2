"""Infrastructure under every app: canonical JSON and digests, and the error vocabulary."""
