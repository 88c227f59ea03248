"""coda_env: Gymnasium environments on real scientific desktop applications.

Importing the package registers every env id (one table, one loop); `gym.make("coda_env:coda/KAlgebra-v0")`
works without importing it first.
"""
from gymnasium.envs.registration import register, registry

#: env id -> app adapter name
ENVS = {
    "coda/KAlgebra-v0": "kalgebra",
}

for _id, _app in ENVS.items():
    if _id not in registry:
        register(id=_id, entry_point="coda_env.env:CodaEnv", kwargs={"app": _app})

__all__ = ["ENVS"]
