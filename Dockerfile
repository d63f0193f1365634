# syntax=docker/dockerfile:1
# The reptables image: one image for the operator (`reptables operator`, the default command) and
# the table engines (`reptables engine serve ...`), as the Helm chart in charts/reptables runs them.
#
#   docker build -t reptables:0.1.0 .
#
# Runs as the non-root user 10001 and works with a read-only root filesystem: HOME is /tmp (the
# chart mounts an emptyDir there) and the engines write only to their --data-dir (/data, a PVC).
# Every dependency has a wheel for linux/amd64 and linux/arm64 (ytsaurus-yson included), so no
# compiler is installed.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# only what the distribution is built from (see pyproject.toml: package-dir and readme)
COPY pyproject.toml README.md ./
COPY engine/ engine/
COPY operator/ operator/
COPY sparkapps/ sparkapps/
COPY cache/ cache/
COPY testing/ testing/
RUN python -m venv /opt/reptables \
 && /opt/reptables/bin/pip install --upgrade pip \
 && /opt/reptables/bin/pip install /src \
 && /opt/reptables/bin/reptables --help >/dev/null

FROM ${PYTHON_IMAGE}
ARG UID=10001
ARG GID=10001
RUN groupadd --system --gid "${GID}" reptables \
 && useradd --system --uid "${UID}" --gid "${GID}" --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin reptables \
 && mkdir -p /data \
 && chown "${UID}:${GID}" /data
COPY --from=build /opt/reptables /opt/reptables
ENV PATH=/opt/reptables/bin:${PATH} \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
USER ${UID}:${GID}
# 8080 kopf liveness (/healthz), 8081 operator metrics, 9012 engine HTTP (YT API, /healthz, /readyz, /metrics)
EXPOSE 8080 8081 9012
ENTRYPOINT ["reptables"]
CMD ["operator", "--all-namespaces"]
