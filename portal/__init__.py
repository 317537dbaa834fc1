"""The white-label operator portal, served under each operator's own host names."""
