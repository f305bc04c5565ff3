"""Small shared utilities: atomic file I/O, hashing, versions, seeding."""
