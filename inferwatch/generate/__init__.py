"""``inferwatch generate``: every generated file of the project, written or checked fresh."""
