"""Development tooling (local servers, the demo, fault injection): in a checkout, not the wheel."""
