"""Shared contracts and mechanisms of loraplex. Services import only from here, never from each other."""
