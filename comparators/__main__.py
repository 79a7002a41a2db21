"""``python -m comparators``: the comparators, one row each, as the registry lists them."""

from comparators.registry import markdown_table

print(markdown_table(), end="")
