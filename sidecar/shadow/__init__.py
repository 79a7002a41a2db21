"""shadow."""
