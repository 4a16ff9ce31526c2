"""The web dashboard: `evagg dashboard`, its aiohttp server and its pages.

`server.py` (the command: flags, the store, serving), `app.py` (the aiohttp application:
routes, errors as JSON), `api.py` (the JSON API over the questions),
`artifact_routes.py` (the download route of shipped files) and `static/` (the pages:
plain HTML, JS and CSS). This is the top room: it may import every other one.
"""

from typing import Final

# where `evagg dashboard` serves (its Ray State API too) unless --listen says otherwise;
# the agent's port names it to Ray's tools pointed at the wrong port
DEFAULT_LISTEN: Final = "127.0.0.1:8050"
