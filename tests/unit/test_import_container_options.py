"""`import` reads a container client's `run` as the client reads it: which options take a value, in every form."""

from __future__ import annotations

import pytest

from supervisor.importing.container import ContainerRefused, ContainerRun, parse_run

SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/m"]


def _run(*words: str) -> ContainerRun:
    return parse_run(list(words))


def test_value_options_take_the_next_word_and_the_image_ends_the_options() -> None:
    """`-v A`, `--shm-size 32g`, `--gpus all` take the next word; the first other word is the image, the rest the command."""
    run = _run(
        "docker", "run", "-v", "/models:/models", "--shm-size", "32g", "--gpus", "all", "--rm",
        "lmsysorg/sglang:latest", *SGLANG,
    )  # fmt: skip
    assert run.image == "lmsysorg/sglang:latest" and list(run.command) == SGLANG
    assert run.values("--volume") == ["/models:/models"]
    assert (run.last("--shm-size"), run.last("--gpus")) == ("32g", "all")
    assert [o.name for o in run.options] == ["--volume", "--shm-size", "--gpus", "--rm"]


def test_equals_forms_and_aliases() -> None:
    """`--opt=value` is one word; `--net` is `--network`; a value may hold `=` (`--security-opt=label=disable`)."""
    run = _run(
        "podman", "run", "--net=host", "--security-opt=label=disable", "--env=A=1", "img", "sglang", "serve"
    )
    assert run.last("--network") == "host"
    assert run.last("--security-opt") == "label=disable"
    assert run.values("--env") == ["A=1"]


@pytest.mark.parametrize(
    ("cluster", "names"),
    [
        ("-it", ["--interactive", "--tty"]),
        ("-dit", ["--detach", "--interactive", "--tty"]),
        ("-itd", ["--interactive", "--tty", "--detach"]),
    ],
)
def test_combined_short_flags(cluster: str, names: list[str]) -> None:
    """Boolean short options combine in one word, in any order."""
    run = _run("docker", "run", cluster, "img", *SGLANG)
    assert [o.name for o in run.options] == names and run.image == "img"


def test_a_short_option_with_its_value_attached_or_last_in_a_cluster() -> None:
    """`-p8080:80`, `-e=A=1` (pflag drops the `=`), and `-itv /a:/b` (the last of a cluster takes the next word)."""
    run = _run("docker", "run", "-p8080:80", "-e=A=1", "-itv", "/a:/b", "-eB=2", "img", *SGLANG)
    assert run.values("--publish") == ["8080:80"]
    assert run.values("--env") == ["A=1", "B=2"]
    assert run.values("--volume") == ["/a:/b"]
    assert [o.flag for o in run.options] == ["-p", "-e", "-i", "-t", "-v", "-e"]


def test_a_boolean_given_a_value_is_kept_as_one_word() -> None:
    """`--rm=false` is the boolean with a value; it is rendered back as written, not as `--rm false`."""
    run = _run("docker", "run", "--rm=false", "--privileged", "img", *SGLANG)
    assert [o.words() for o in run.options] == [["--rm=false"], ["--privileged"]]


def test_client_options_container_run_and_double_dash() -> None:
    """The client's own options come before `run` (`nerdctl --namespace k8s.io`, `docker -H …`); `container run`
    is `run`; `--` ends the options (the next word is the image even if it starts with `-`)."""
    run = _run("/usr/local/bin/nerdctl", "--namespace", "k8s.io", "run", "--rm", "img", *SGLANG)
    assert run.client == "nerdctl" and [o.words() for o in run.client_options] == [["--namespace", "k8s.io"]]
    run = _run("docker", "-H", "unix:///run/docker.sock", "container", "run", "--", "img", *SGLANG)
    assert run.subcommand == ("container", "run") and run.image == "img" and not run.options


def test_client_specific_options() -> None:
    """podman's `--replace`, `--sdnotify=conmon`, `--pull=newer`; nerdctl's global `-n`: each client's own table."""
    run = _run("podman", "run", "--replace", "--sdnotify=conmon", "--pull=newer", "img", *SGLANG)
    assert [o.name for o in run.options] == ["--replace", "--sdnotify", "--pull"]
    with pytest.raises(ContainerRefused, match="--replace"):
        _run("docker", "run", "--replace", "img", *SGLANG)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["docker", "run", "--frobnicate", "img", *SGLANG],
            "option --frobnicate is not one the import knows",
        ),
        (["docker", "run", "-itz", "img", *SGLANG], "option -z (in -itz) is not one the import knows"),
        (["podman", "--frob", "run", "img"], "podman: option --frob"),
        (["docker", "run", "--name"], "option --name needs a value"),
        (["docker", "run", "--rm", "--gpus", "all"], "names no image"),
        (["docker", "exec", "sglang", "python3"], "`docker exec`: not `docker run`"),
    ],
)
def test_what_cannot_be_read_is_refused_by_name(argv: list[str], said: str) -> None:
    """An unknown option (long, in a cluster, of the client), a missing value or image, another subcommand:
    refused with the word named, never guessed."""
    with pytest.raises(ContainerRefused) as caught:
        parse_run(argv)
    assert said in str(caught.value)


def test_the_label_names_the_container_or_its_image() -> None:
    """Messages name a container by `--name` (with its image), else by its image."""
    assert _run("docker", "run", "--name", "kimi", "img:1", *SGLANG).label == "container kimi (img:1)"
    assert _run("docker", "run", "img:1", *SGLANG).label == "the container of image img:1"
