"""A password hasher for the tests' own process: Django's PBKDF2 at one iteration.

Every console user the tests make has a password; at the production hasher's million
iterations each costs about 0.2 s of CPU to make and again to check, which the suite paid
hundreds of times over. The hash keeps PBKDF2's name and format (``pbkdf2_sha256$1$...``),
so a server started by a test with the production settings still checks it (PBKDF2 reads
the iterations from the hash) and upgrades it on its first sign-in, as it would any hash
made with fewer iterations than its own.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1
