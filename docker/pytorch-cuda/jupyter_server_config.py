# umprov container Jupyter server configuration (system-wide, /etc/jupyter).
# The token is never written here, nor given in an environment (a process's environment stays
# readable in /proc for its life, and kernels and terminals inherit it: `!env` in a notebook
# would print it): the entrypoint leaves it in a file only this user reads, named by
# JUPYTER_TOKEN_FILE. A JUPYTER_TOKEN set by hand is taken out of the environment all the same.
import os

c = get_config()  # noqa: F821 (provided by Jupyter when it loads this file)

os.environ.pop("JUPYTER_TOKEN", None)
with open(os.environ["JUPYTER_TOKEN_FILE"], encoding="utf-8") as _fh:
    _token = _fh.read().strip()
if len(_token) < 16:
    raise SystemExit("umprov: the Jupyter token file holds no token of 16 characters or more")
c.IdentityProvider.token = _token
del _token, _fh

c.ServerApp.ip = os.environ.get("JUPYTER_IP", "0.0.0.0")  # noqa: S104 (inside the container)
c.ServerApp.port = int(os.environ.get("JUPYTER_PORT", "8888"))
c.ServerApp.port_retries = 0
c.ServerApp.open_browser = False
c.ServerApp.allow_root = False
c.ServerApp.root_dir = "/workspace"
# Reached through a published port or a tunnel, so the Host header is not localhost; the token
# is what guards access.
c.ServerApp.allow_remote_access = True
# Token only: no password login, no way to replace the token with a password from the browser.
c.PasswordIdentityProvider.hashed_password = ""
c.PasswordIdentityProvider.allow_password_change = False
c.ServerApp.quit_button = False
