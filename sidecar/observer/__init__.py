"""observer."""
