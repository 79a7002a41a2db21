"""Stage 4: join both runs of an entry, compare them, publish and read back verdicts."""
