"""The autopilot: a plan of served shares, stepped through by the gate's decisions."""
