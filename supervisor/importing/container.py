"""A container client's command line (`docker run …`, `podman run …`, `nerdctl run …`), read as the client reads it.

The client's own options come first (`podman --root DIR run`, `nerdctl --namespace k8s.io run`), then `run` (or
`container run`), then the options of `run` up to the first word that is not one (the image) or a `--`; the
words after the image are the container's command. Options are read as the clients' flag parser (pflag) reads
them: `--opt value` and `--opt=value`; short options alone or combined (`-it`, `-dit`, `-p8080:80`, `-e=A=1`),
the last of a combination may take a value (`-itv /a:/b`); a boolean may be given a value (`--rm=false`). An
option the tables do not know is refused by name: its arity would be a guess, and a wrong guess takes the image
for a value or a value for the image.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RUN_CLIENTS = ("docker", "podman", "nerdctl")
# Options of `run` that take a value, common to the three clients; `-x|--long` names a short alias.
_RUN_VALUES = """
-a|--attach --add-host --annotation --blkio-weight --blkio-weight-device --cap-add --cap-drop --cgroup-parent
--cgroupns --cidfile --cpu-period --cpu-quota --cpu-rt-period --cpu-rt-runtime -c|--cpu-shares --cpus
--cpuset-cpus --cpuset-mems --detach-keys --device --device-cgroup-rule --device-read-bps --device-read-iops
--device-write-bps --device-write-iops --dns --dns-option --dns-search --domainname --entrypoint -e|--env
--env-file --expose --gpus --group-add --health-cmd --health-interval --health-retries --health-start-period
--health-start-interval --health-timeout -h|--hostname --ip --ip6 --ipc --isolation --kernel-memory -l|--label
--label-file --link --link-local-ip --log-driver --log-opt --mac-address -m|--memory --memory-reservation
--memory-swap --memory-swappiness --mount --name --network --network-alias --oom-score-adj --pid --pids-limit
--platform -p|--publish --pull --restart --runtime --security-opt --shm-size --stop-signal --stop-timeout
--storage-opt --sysctl --tmpfs --ulimit -u|--user --userns --uts -v|--volume --volume-driver --volumes-from
-w|--workdir
"""
_RUN_FLAGS = """
-d|--detach --disable-content-trust --help --init -i|--interactive --no-healthcheck --oom-kill-disable
--privileged -P|--publish-all -q|--quiet --read-only --rm --sig-proxy -t|--tty
"""
_PODMAN_VALUES = """
--arch --authfile --cgroup-conf --cgroups --chrootdirs --conmon-pidfile --decryption-key --env-merge --gidmap
--group-entry --health-on-failure --health-startup-cmd --health-startup-interval --health-startup-retries
--health-startup-success --health-startup-timeout --hostuser --image-volume --init-path --mask --os
--passwd-entry --personality --pidfile --pod --pod-id-file --preserve-fd --preserve-fds --rdt-class --requires
--retry --retry-delay --sdnotify --seccomp-policy --secret --shm-size-systemd --subgidname --subuidname
--systemd --timeout --tz --uidmap --umask --unmask --unsetenv --variant
"""
_PODMAN_FLAGS = (
    "--env-host --http-proxy --no-hosts --passwd --read-only-tmpfs --replace --rmi --rootfs --tls-verify"
)
_NERDCTL_VALUES = "--cosign-key --ipfs-address --pidfile --umask --verify"
_NERDCTL_FLAGS = "--rootfs"
# The clients' own options, before `run`.
_GLOBAL = {
    "docker": (
        "--config -c|--context -H|--host -l|--log-level --tlscacert --tlscert --tlskey",
        "-D|--debug --tls --tlsverify",
    ),
    "podman": (
        "--cdi-spec-dir --cgroup-manager --conmon -c|--connection --db-backend --events-backend --hooks-dir "
        "--identity --imagestore --log-level --module --network-cmd-path --network-config-dir --out --root "
        "--runroot --runtime --runtime-flag --ssh --storage-driver --storage-opt --tmpdir --url --volumepath",
        "-r|--remote --syslog --transient-store",
    ),
    "nerdctl": (
        "-a|--address --bridge-ip --cgroup-manager --cni-netconfpath --cni-path --data-root --host-gateway-ip "
        "--hosts-dir -n|--namespace --snapshotter --storage-driver",
        "--debug --debug-full --experimental --insecure-registry --kube-hide-dupe",
    ),
}
_RUN_EXTRA = {
    "docker": ("", ""),
    "podman": (_PODMAN_VALUES, _PODMAN_FLAGS),
    "nerdctl": (_NERDCTL_VALUES, _NERDCTL_FLAGS),
}
_ALIASES = {"--net": "--network", "--net-alias": "--network-alias"}


class ContainerRefused(ValueError):
    """A client command line the import cannot read (the message says which word, and why)."""


@dataclass(frozen=True)
class Option:
    """One option as given: the flag as written (`-v`, `--volume`), its long name, its value (None: a bare flag)."""

    flag: str
    name: str
    value: str | None
    takes_value: bool

    def words(self) -> list[str]:
        """The option as words of a command line (a boolean with a value as `--name=value`)."""
        if self.value is None:
            return [self.flag]
        return [self.flag, self.value] if self.takes_value else [f"{self.name}={self.value}"]


@dataclass(frozen=True)
class ContainerRun:
    """One `CLIENT [OPTIONS] run [OPTIONS] IMAGE [COMMAND…]`."""

    program: str  # as written: /usr/bin/docker
    client: str  # docker, podman or nerdctl
    client_options: tuple[Option, ...]
    subcommand: tuple[str, ...]  # ("run",) or ("container", "run")
    options: tuple[Option, ...]
    image: str
    command: tuple[str, ...]

    def values(self, name: str) -> list[str]:
        """Every value given to the option `name` (its long form), in order."""
        return [o.value for o in self.options if o.name == name and o.value is not None]

    def last(self, name: str) -> str | None:
        """The value that counts for a single-valued option (the last one), or None."""
        found = self.values(name)
        return found[-1] if found else None

    @property
    def label(self) -> str:
        """How messages name it: `container sglang (lmsysorg/sglang:latest)`, or by its image."""
        name = self.last("--name")
        return f"container {name} ({self.image})" if name else f"the container of image {self.image}"


@dataclass(frozen=True)
class _Table:
    """Long name → whether it takes a value; short letter → long name."""

    takes_value: dict[str, bool]
    short: dict[str, str]


def _table(values: str, flags: str) -> _Table:
    takes: dict[str, bool] = {}
    short: dict[str, str] = {}
    for words, valued in ((values, True), (flags, False)):
        for spec in words.split():
            letter, _, name = spec.rpartition("|")
            takes[name] = valued
            if letter:
                short[letter] = name
    return _Table(takes, short)


def is_run_client(argv: list[str]) -> bool:
    """True when the program is docker, podman or nerdctl (by its name, wherever it lies)."""
    return bool(argv) and Path(argv[0]).name in RUN_CLIENTS


def parse_run(argv: list[str]) -> ContainerRun:
    """The `run` command line of a docker, podman or nerdctl client; ContainerRefused when it is not one."""
    client = Path(argv[0]).name
    globals_, i = _options(argv, 1, _table(*_GLOBAL[client]), client)
    rest = argv[i:]
    sub = next((s for s in (("run",), ("container", "run")) if tuple(rest[: len(s)]) == s), None)
    if sub is None:
        what = " ".join(rest[:2] if rest[:1] == ["container"] else rest[:1]) or "(nothing)"
        raise ContainerRefused(f"`{client} {what}`: not `{client} run`")
    extra_values, extra_flags = _RUN_EXTRA[client]
    table = _table(f"{_RUN_VALUES} {extra_values}", f"{_RUN_FLAGS} {extra_flags}")
    options, at = _options(argv, i + len(sub), table, f"{client} run")
    if at >= len(argv):
        raise ContainerRefused(f"`{client} run` names no image")
    return ContainerRun(
        argv[0], client, tuple(globals_), sub, tuple(options), argv[at], tuple(argv[at + 1 :])
    )


def _options(argv: list[str], i: int, table: _Table, where: str) -> tuple[list[Option], int]:
    """The options from `argv[i]` on, and the index of the first word after them."""
    found: list[Option] = []
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return found, i + 1
        if not word.startswith("-") or word == "-":
            break
        if word.startswith("--"):
            flag, eq, value = word.partition("=")
            name = _ALIASES.get(flag, flag)
            if name not in table.takes_value:
                raise ContainerRefused(f"{where}: option {flag} is not one the import knows")
            valued = table.takes_value[name]
            if valued and not eq:
                i += 1
                value = _value(argv, i, flag, where)
            found.append(Option(flag, name, value if eq or valued else None, valued))
        else:
            i = _short(argv, i, table, where, found)
        i += 1
    return found, i


def _short(argv: list[str], i: int, table: _Table, where: str, found: list[Option]) -> int:
    """A cluster of short options (`-dit`, `-p8080:80`, `-itv /a:/b`); the index of its last word."""
    word = argv[i]
    for at in range(1, len(word)):
        flag = f"-{word[at]}"
        if flag not in table.short:
            raise ContainerRefused(f"{where}: option {flag} (in {word}) is not one the import knows")
        name = table.short[flag]
        if not table.takes_value[name]:
            found.append(Option(flag, name, None, False))
            continue
        rest = word[at + 1 :]
        if at == 1 and rest.startswith("="):
            rest = rest[1:]
        if not rest:
            i += 1
            rest = _value(argv, i, flag, where)
        found.append(Option(flag, name, rest, True))
        break
    return i


def _value(argv: list[str], i: int, flag: str, where: str) -> str:
    if i >= len(argv):
        raise ContainerRefused(f"{where}: option {flag} needs a value")
    return argv[i]
