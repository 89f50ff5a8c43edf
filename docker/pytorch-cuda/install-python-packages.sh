#!/bin/sh
# Install requirements.txt from the carried wheels into a virtual environment, with no index.
#   install-python-packages.sh VENV WHEELS_DIR
# The venv sees the base image's own packages (--system-site-packages), so torch from the
# official image is used as is; on a base without torch, wheels/ carries it.
set -eu
venv=$1
wheels=$2
python=$(command -v python3 || command -v python)
# --without-pip: Debian's python3 has no ensurepip; pip comes from the carried wheel instead.
"$python" -m venv --system-site-packages --without-pip "$venv"
pip_wheel=$(ls "$wheels"/pip-*.whl | head -n 1)
"$venv/bin/python" "$pip_wheel/pip" install --no-index --find-links "$wheels" \
    --no-cache-dir --disable-pip-version-check --no-compile -r "$wheels/requirements.txt"
# The kernel Jupyter starts must be this environment's python.
"$venv/bin/python" -m ipykernel install --prefix "$venv" --name python3 --display-name "Python 3"
"$venv/bin/python" -c "import jupyterlab"
# torch comes from the base or from a carried wheel; a base without either gets an image without
# torch (the lab's, where no CPU wheel could be had), which umprov verify reports as such.
if grep -q '^torch==' "$wheels/requirements.txt" || "$venv/bin/python" -c "import torch" 2>/dev/null
then
    "$venv/bin/python" -c "import torch; print('python packages ok: torch', torch.__version__)"
else
    echo "python packages ok: NO torch in this image (the base has none and no wheel was carried)"
fi
