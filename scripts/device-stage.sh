#!/usr/bin/env bash
# On a GPU machine: copies what one transfer carried (a folder that
# scripts/device-carry.sh wrote) to a staging folder outside the checkout,
# which stays while the machine is held, since the carried files are gone
# at the next transfer. device-check reads model parts and the bundle
# archive from there (DEVICE_CHECK_STAGE).
#
#   scripts/device-stage.sh FOLDER...
#
# Environment: DEVICE_CHECK_STAGE, the staging folder (/tmp/llminfer-stage).
set -euo pipefail

stage=${DEVICE_CHECK_STAGE:-/tmp/llminfer-stage}
if [ "$#" -eq 0 ]; then
    echo "usage: scripts/device-stage.sh FOLDER..." >&2
    exit 2
fi
mkdir -p "$stage"
for d in "$@"; do
    if [ ! -d "$d" ]; then
        echo "device-stage: '$d' is not a folder (was it carried?)" >&2
        exit 2
    fi
    cp -f -- "$d"/* "$stage"/
done
echo "device-stage: $stage holds:"
ls -l -- "$stage"
