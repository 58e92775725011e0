"""qdebug's Voila configuration (``qdebug dashboard`` passes this folder with ``--Voila.config_file_paths``).

When the page closes, Voila's front end posts its kernel's shutdown with the ``_xsrf`` cookie as the form token, but
Voila's page handler never reads the token, so Tornado never sets that cookie and every shutdown was refused
("403 '_xsrf' argument missing"): the kernel stayed until the idle cull. Reading the token while the page is served
sets the cookie (Tornado does on first read), and the shutdown goes through with the XSRF check still on.
"""

from typing import Any


def _set_xsrf_cookie(req: Any, notebook: Any, cwd: str) -> None:
    """Voila's pre-launch hook: read the request's XSRF token, which makes Tornado send the ``_xsrf`` cookie."""
    req.xsrf_token  # noqa: B018 - read for its side effect (the cookie); the hook returns no notebook


c = get_config()  # type: ignore[name-defined]  # noqa: F821 - the name traitlets gives a config file
c.VoilaConfiguration.prelaunch_hook = _set_xsrf_cookie
