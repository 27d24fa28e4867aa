"""The endpoint's routes, one router per concern: ``metrics``, ``health`` (the probes),
``cameras`` (the camera API) and ``view`` (the live view's page, frames and stats). Each
module's ``router(...)`` takes what its routes need and returns a FastAPI ``APIRouter``."""
