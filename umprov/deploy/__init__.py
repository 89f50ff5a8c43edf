"""`umprov deploy`: the PyTorch container on every host, over the docker SDK and verified SSH.

One module per part, in the order a deploy goes through them:

    options.py    the command line and host variables, checked and settled per host
    spec.py       the container as plain data, its hash and labels, docker SDK arguments
    outcome.py    one host during the run, and how its errors become its outcome
    pull.py       --pull: each host's engine pulls, its progress relayed
    push.py       --push: one local docker save streamed to the hosts that lack the image
    stream.py     the broadcast under push, and its rewrite for hosts that hold some layers
    image_tar.py  the docker save tar format: which layers a host holds, the rewrite itself
    rollout.py    keep or replace the container, wait for it, pin its key, store its token
    state.py      what is kept on this machine: tokens, ssh configs, connection records
    run.py        deploy(): every host, at most --forks connections open at once

Secrets (the Jupyter token) are never in the spec, the labels, the environment or any log:
the token goes into the container as a file (put_archive before start) and onto the control
machine under state_dir()/tokens.
"""
