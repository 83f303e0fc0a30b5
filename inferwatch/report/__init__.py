"""Reports totalled from what inferwatch itself recorded."""
