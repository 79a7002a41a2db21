"""The composition root: builds every client once, wires the stages, runs and supervises them."""
