"""Everything that touches the box: transports, the Box API built on them, and the box tools."""
