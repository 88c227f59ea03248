"""ScienceBoard's KAlgebra task files as coda tasks (filled in below)."""
