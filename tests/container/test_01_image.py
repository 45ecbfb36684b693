"""The shipped Dockerfile, built unchanged by each engine from the tier's wheel (once, by the `engine` fixture)."""

from __future__ import annotations

from tests.container.engines import Engine
from tests.container.image import TAG
from tests.container.running import ENTRYPOINT


def test_the_shipped_dockerfile_builds_unchanged_with_its_entrypoint_stop_signal_and_healthcheck(
    engine: Engine,
) -> None:
    """The image the engine built keeps the Dockerfile's exec-form ENTRYPOINT (the supervisor as PID 1), SIGTERM
    as its stop signal and its HEALTHCHECK on the status port (podman keeps it in the docker format only)."""
    inspected = engine.inspect(TAG)
    image = inspected["Config"]
    assert image["Entrypoint"] == ENTRYPOINT, "not the exec form: a shell as PID 1 does not pass signals on"
    assert image["StopSignal"] == "SIGTERM"
    check = (image.get("Healthcheck") or inspected["Healthcheck"])["Test"]  # podman: beside Config
    assert check[0] == "CMD" and "http://127.0.0.1:9400/healthz" in " ".join(check), check
    assert 9400 in {int(p.split("/")[0]) for p in image["ExposedPorts"]}
