#!/usr/bin/env bash
# Set up a fresh Debian 12 machine for framebatch: Debian packages when missing, a virtual
# environment in .venv, and the project installed into it.  Safe to run again (it only adds
# what is missing).  `--tests` also installs what the test suite needs (GStreamer RTSP server,
# Prometheus, Chromium);
# `--export` the optional Ultralytics extra that turns a downloaded .pt into ONNX.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(redis-server ffmpeg python3-venv)
if [[ "${1:-}" == "--tests" ]]; then
  packages+=(gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good
             gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly gstreamer1.0-libav python3-gi
             prometheus chromium  # promtool and a real Prometheus; the live view in a browser
             iproute2  # ip netns: hosts for the several-hosts tests
             mosquitto openssl  # a real MQTT broker, and certificates for its TLS listener
             nats-server)  # a real NATS server with JetStream: tests/integration/test_output_nats.py
  # the tests cover the torch and OpenVINO backends and `framebatch export`: their extras
  extras="[test,ultralytics,openvino]"
elif [[ "${1:-}" == "--export" ]]; then
  extras="[ultralytics]"
else
  extras=""
fi

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  echo "bootstrap: creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
stamp=".venv/.framebatch-installed${extras}"
if [[ ! -f "$stamp" || pyproject.toml -nt "$stamp" ]]; then
  echo "bootstrap: installing framebatch${extras} into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  if [[ "$extras" == *ultralytics* ]]; then
    # pinned first: an unpinned torch resolves to a multi-GB download; these come from local disk
    .venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.14.1}" \
      "torchvision==${TORCHVISION_VERSION:-0.29.1}"
  fi
  .venv/bin/python -m pip install -q -e ".${extras}"
  touch "$stamp"
fi
