"""Who uses the console: sign-in (passwords, single sign-on, passkeys), roles from the
directory's groups, sessions, and the audit events of each."""
