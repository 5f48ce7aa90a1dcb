#!/usr/bin/env bash
# `make compose-test`: the compose test stack and the deployment tests against real containers.
#
#  1. starts a Docker engine if none answers (dockerd in the background; needs root);
#  2. makes sure the base images exist: pulled, or, where Docker Hub cannot be reached, built as local
#     stand-ins with $STANDINS (../shared/tools/docker-standins by default);
#  3. builds the images (BuildKit: the layer cache makes a rebuild after a source edit cheap);
#  4. runs the test stack (docker/docker-compose.test.yml, project shoal-test) to the exit code of its
#     `tests` service, then takes it down with its volumes;
#  5. runs tests/compose/test_compose_stack.py (the main stack's deployment cases) with a project of its own;
#  6. runs tests/compose/test_sidecar_stack.py against the sidecar stack (docker/docker-compose.sidecar.yml,
#     project shoal-sidecar: Apache Kafka 3.9, two sidecars and the example Spark job): the stack's `tests`
#     service inside it, then the Spark job through the sidecars across a SIGKILL of one; where the
#     apache/kafka image cannot be pulled, over a standalone Shoal upstream instead
#     (docker/docker-compose.sidecar.shoal-upstream.yml).
# The exit code is non-zero if either run failed: 2 when this machine cannot run the stacks at all (no engine
# can be started, too little disk, no base image) and 3 when the images cannot be built (the package
# mirrors or PyPI unreachable, or a broken Dockerfile), so a caller can tell those from a failed test.
set -euo pipefail
cd "$(dirname "$0")/.."

STANDINS=${STANDINS:-../shared/tools/docker-standins}
PYTEST=${PYTEST:-.venv/bin/pytest}
DOCKERD_ARGS=${DOCKERD_ARGS:---storage-driver=vfs}
DOCKERD_LOG=${DOCKERD_LOG:-/tmp/shoal-dockerd.log}
BASE_IMAGE=python:3.11-slim-bookworm
TEST_PROJECT=shoal-test
# Creating several containers at once on the vfs driver copies each image's files: slower than compose's
# default 60 s read timeout on a loaded machine.
export COMPOSE_HTTP_TIMEOUT=${COMPOSE_HTTP_TIMEOUT:-600}

log() { echo "compose-test: $*" >&2; }

# The exit code, also written here for callers that run this through make (which turns it into 2).
STATUS_FILE=${COMPOSE_TEST_STATUS_FILE:-/tmp/shoal-compose-test.status}
rm -f "$STATUS_FILE"
record_status() { echo "$1" >"$STATUS_FILE"; }

# An engine this script started is stopped again at the end (KEEP_DOCKERD=1 leaves it running), so a CI
# job leaves no daemon behind; the images and the build cache stay on disk for the next run.
started_dockerd=
stop_engine() {
    [ -n "$started_dockerd" ] && [ -z "${KEEP_DOCKERD:-}" ] || return 0
    kill "$started_dockerd" 2>/dev/null || return 0
    for _ in $(seq 60); do kill -0 "$started_dockerd" 2>/dev/null || return 0; sleep 1; done
    log "dockerd ($started_dockerd) still running after 60 s"
}
trap 'record_status $?; stop_engine' EXIT

start_engine() {
    docker info >/dev/null 2>&1 && return 0
    command -v dockerd >/dev/null || { log "no Docker engine and no dockerd (apt-get install docker.io docker-compose debootstrap)"; exit 2; }
    log "starting dockerd $DOCKERD_ARGS (log: $DOCKERD_LOG)"
    # shellcheck disable=SC2086
    nohup dockerd $DOCKERD_ARGS >"$DOCKERD_LOG" 2>&1 &
    started_dockerd=$!
    for _ in $(seq 120); do
        docker info >/dev/null 2>&1 && return 0
        sleep 1
    done
    log "dockerd did not answer; its log:"; tail -20 "$DOCKERD_LOG" >&2; exit 2
}

# BuildKit needs a docker CLI that has it: built in before 23.0, the buildx plugin from 23.0 on. Compose v1
# builds through the `docker` on PATH (COMPOSE_DOCKER_CLI_BUILD=1), so put such a CLI first on PATH.
buildkit_cli() {
    local cli version
    for cli in "$(command -v docker)" /usr/bin/docker; do
        [ -x "$cli" ] || continue
        if "$cli" buildx version >/dev/null 2>&1; then echo "$cli"; return 0; fi
        version=$("$cli" version --format '{{.Client.Version}}' 2>/dev/null || true)
        if [ -n "$version" ] && [ "${version%%.*}" -lt 23 ]; then echo "$cli"; return 0; fi
    done
    return 1
}

compose_cli() {
    if docker compose version >/dev/null 2>&1; then echo "docker compose"; else echo "docker-compose"; fi
}

# On vfs every layer is a full copy: a cold build of the three images peaks near 20 GB.
MIN_FREE_GB=${MIN_FREE_GB:-25}
check_disk() {
    local root free_kb
    root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)
    mkdir -p "$root"
    free_kb=$(df -Pk "$root" | awk 'NR == 2 {print $4}')
    if [ "$free_kb" -lt $((MIN_FREE_GB * 1024 * 1024)) ]; then
        log "only $((free_kb / 1024 / 1024)) GB free under $root; a cold build needs about $MIN_FREE_GB GB"
        exit 2
    fi
}

ensure_base_image() {
    docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && return 0
    if timeout 120 docker pull "$BASE_IMAGE" >/dev/null 2>&1; then return 0; fi
    [ -x "$STANDINS/make-base-image.sh" ] || { log "cannot pull $BASE_IMAGE and no stand-in script at $STANDINS"; exit 2; }
    log "building the $BASE_IMAGE stand-in with $STANDINS/make-base-image.sh"
    "$STANDINS/make-base-image.sh" >/tmp/shoal-base-image.log 2>&1 || { tail -30 /tmp/shoal-base-image.log >&2; exit 2; }
}

start_engine
check_disk
ensure_base_image

if cli=$(buildkit_cli); then
    shim=$(mktemp -d)
    ln -s "$cli" "$shim/docker"
    export PATH="$shim:$PATH" DOCKER_BUILDKIT=1 COMPOSE_DOCKER_CLI_BUILD=1
else
    log "no docker CLI with BuildKit here: building with the legacy builder (slow on vfs)"
fi
read -r -a COMPOSE <<<"$(compose_cli)"
export SHOAL_COMPOSE="${COMPOSE[*]}"
test_stack=("${COMPOSE[@]}" -p "$TEST_PROJECT" -f docker/docker-compose.test.yml)

# The images a rebuild replaces stay behind untagged (on vfs each costs its full size); remember what the
# tags named so that those, and only those, can be removed at the end.
IMAGES=(shoal-broker:local shoal-tests:local shoal-spark-orders-job:local)
old_ids=$(docker image inspect --format '{{.Id}}' "${IMAGES[@]}" 2>/dev/null || true)
remove_replaced_images() {
    local current id
    current=$(docker image inspect --format '{{.Id}}' "${IMAGES[@]}" 2>/dev/null || true)
    for id in $old_ids; do
        grep -qx "$id" <<<"$current" || docker rmi "$id" >/dev/null 2>&1 || true
    done
}

log "building images"
"${test_stack[@]}" build || { log "building the test stack's images failed"; exit 3; }
# The main stack's own images too (tests/compose starts it with --build, which is then a cache hit).
"${COMPOSE[@]}" -p shoal-build -f docker/docker-compose.yml build shoal spark-orders-job \
    || { log "building the main stack's images failed"; exit 3; }

status=0
cleanup() { "${test_stack[@]}" down -v --remove-orphans >/dev/null 2>&1 || true; }
trap 'record_status $?; cleanup; remove_replaced_images; stop_engine' EXIT
cleanup  # a stack left over from an interrupted run
log "running the test stack"
"${test_stack[@]}" up --no-build --exit-code-from tests || status=$?
cleanup
log "test stack exit code: $status"

# It builds the main stack's images itself (`up --build`), so it also runs on its own.
log "running tests/compose against the main stack"
SHOAL_COMPOSE_TESTS=1 "$PYTEST" -q -p no:cacheprovider tests/compose/test_compose_stack.py || status=$?

SIDECAR_PROJECT=shoal-sidecar
KAFKA_IMAGE=$(sed -n 's/^ *image: *\(apache\/kafka:[^ ]*\).*/\1/p' docker/docker-compose.sidecar.yml | head -1)
sidecar_stack=("${COMPOSE[@]}" -p "$SIDECAR_PROJECT" -f docker/docker-compose.sidecar.yml)
# The test module picks the same files: the apache/kafka image where this engine has it, else the override.
if docker image inspect "$KAFKA_IMAGE" >/dev/null 2>&1 || timeout 300 docker pull "$KAFKA_IMAGE" >/dev/null 2>&1; then
    upstream="$KAFKA_IMAGE"
else
    # The rest of the stack still runs for real, over a standalone Shoal broker as the upstream.
    log "cannot pull $KAFKA_IMAGE: the sidecar stack runs over a standalone Shoal upstream instead"
    sidecar_stack+=(-f docker/docker-compose.sidecar.shoal-upstream.yml)
    upstream="a standalone Shoal upstream"
fi
# The test module takes its stack down itself; this is for a run interrupted before it could.
sidecar_cleanup() { "${sidecar_stack[@]}" down -v --remove-orphans >/dev/null 2>&1 || true; }
trap 'record_status $?; cleanup; sidecar_cleanup; remove_replaced_images; stop_engine' EXIT
sidecar_cleanup
log "running tests/compose/test_sidecar_stack.py against the sidecar stack ($upstream)"
sidecar_status=0
# -s: the module prints the `tests` service's own summary line.
SHOAL_COMPOSE_TESTS=1 SHOAL_SIDECAR_COMPOSE_PROJECT="$SIDECAR_PROJECT" \
    "$PYTEST" -q -s -p no:cacheprovider tests/compose/test_sidecar_stack.py || sidecar_status=$?
sidecar_cleanup
log "sidecar stack exit code: $sidecar_status"
[ "$sidecar_status" -eq 0 ] || status=$sidecar_status
exit "$status"
