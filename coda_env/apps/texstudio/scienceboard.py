"""ScienceBoard's TeXstudio tasks -> coda task dicts (placeholder, filled below)."""
def convert(sb: dict, path: str) -> dict:
    raise NotImplementedError
