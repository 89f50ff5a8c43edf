# umprov container Jupyter server configuration (system-wide, /etc/jupyter).
# The token is never written here: the entrypoint passes it from the deploy in JUPYTER_TOKEN.
# It is taken out of the environment at once, so kernels and terminals (children of this
# process) do not inherit it: `!env` in a notebook would otherwise print it into the notebook.
import os

c = get_config()  # noqa: F821 (provided by Jupyter when it loads this file)

_token = os.environ.pop("JUPYTER_TOKEN", "")
if _token:
    c.IdentityProvider.token = _token
del _token

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
