"""The code sandbox suite; `hostile` holds the hostile-program corpus (test support, not shipped)."""
