"""TRL's surface (being assembled)."""
