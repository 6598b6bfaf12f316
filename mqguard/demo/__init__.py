"""``mqguard demo``: every guarantee on real servers, then the Spark audit of what happened."""
