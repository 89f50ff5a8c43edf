# umprov container Jupyter server configuration (system-wide, /etc/jupyter).
# The token is NEVER set here: the entrypoint passes it from the deploy through JUPYTER_TOKEN,
# which jupyter_server's IdentityProvider reads, and refuses to start without one.
import os

c = get_config()  # noqa: F821 (provided by Jupyter when it loads this file)

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
