#!/usr/bin/python3
"""umprov lab stand-in for nvidia-ctk @UPSTREAM@: the subcommands the roles and tests use.

runtime configure really edits the runtime's config (Docker: daemon.json, keeping every key);
cdi generate fails as the real one does without a driver (NVML cannot be loaded), and writes a
spec with no devices where a driver answers.
"""
import argparse
import json
import os
import sys

VERSION = "@UPSTREAM@"


def runtime_configure(args):
    if args.runtime != "docker":
        print(f"ERRO[0000] unsupported runtime {args.runtime!r} in the umprov lab stand-in",
              file=sys.stderr)
        return 1
    path = args.config or "/etc/docker/daemon.json"
    config = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
        if text:
            config = json.loads(text)
    runtimes = config.setdefault("runtimes", {})
    runtimes["nvidia"] = {"args": [], "path": "nvidia-container-runtime"}
    if args.set_as_default:
        config["default-runtime"] = "nvidia"
    if args.dry_run:
        print(json.dumps(config, indent=4))
        return 0
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".nvidia-ctk.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=4)
        fh.write("\n")
    os.replace(tmp, path)
    print(f"INFO[0000] Wrote updated config to {path}")
    print("INFO[0000] It is recommended that docker daemon be restarted.")
    return 0


def cdi_generate(args):
    if not os.path.exists("/proc/driver/nvidia/version"):
        print("ERRO[0000] failed to generate CDI spec: failed to create device CDI specs: "
              "failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND", file=sys.stderr)
        return 1
    spec = (
        "---\n"
        "cdiVersion: 0.5.0\n"
        "kind: nvidia.com/gpu\n"
        "devices: []\n"
        "containerEdits: {}\n"
    )
    if args.output:
        os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(spec)
        print(f"INFO[0000] Generated CDI spec with version 0.5.0 to {args.output}")
    else:
        sys.stdout.write(spec)
    return 0


def cdi_list(_args):
    print("INFO[0000] Found 0 CDI devices")
    return 0


def dev_char_symlinks(_args):
    if not os.path.exists("/proc/driver/nvidia/version"):
        print("INFO[0000] No NVIDIA devices found; no /dev/char symlinks created")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="nvidia-ctk")
    parser.add_argument("--version", action="store_true")
    parser.add_argument("--debug", "-d", action="store_true")
    sub = parser.add_subparsers(dest="command")

    runtime = sub.add_parser("runtime").add_subparsers(dest="action")
    configure = runtime.add_parser("configure")
    configure.add_argument("--runtime", default="docker")
    configure.add_argument("--config", default="")
    configure.add_argument("--set-as-default", action="store_true")
    configure.add_argument("--dry-run", action="store_true")
    configure.set_defaults(func=runtime_configure)

    cdi = sub.add_parser("cdi").add_subparsers(dest="action")
    generate = cdi.add_parser("generate")
    generate.add_argument("--output", default="")
    generate.add_argument("--format", default="yaml")
    generate.set_defaults(func=cdi_generate)
    cdi.add_parser("list").set_defaults(func=cdi_list)

    system = sub.add_parser("system").add_subparsers(dest="action")
    links = system.add_parser("create-dev-char-symlinks")
    links.add_argument("--create-all", action="store_true")
    links.set_defaults(func=dev_char_symlinks)

    args = parser.parse_args(argv)
    if args.version:
        print(f"NVIDIA Container Toolkit CLI version {VERSION} (umprov lab stand-in)")
        return 0
    func = getattr(args, "func", None)
    if func is None:
        parser.print_usage(sys.stderr)
        return 2
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
