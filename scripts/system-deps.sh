#!/usr/bin/env bash
# What the test suite needs from the system besides Python: strace (the I/O-fault
# tests, Linux only), a Chromium or Chrome (the HTML report is loaded in it,
# headless) and curl. Installed with apt-get when running as root on Debian or
# Ubuntu; otherwise named, and the tests that need them fail (they never skip).
set -uo pipefail

missing=()
if [ "$(uname)" = Linux ] && ! command -v strace >/dev/null 2>&1; then missing+=(strace); fi
browser=""
for candidate in chromium chromium-browser google-chrome google-chrome-stable \
	"/Applications/Google Chrome.app/Contents/MacOS/Google Chrome" \
	"/Applications/Chromium.app/Contents/MacOS/Chromium"; do
	if command -v "$candidate" >/dev/null 2>&1 || [ -x "$candidate" ]; then browser=$candidate; break; fi
done
[ -n "$browser" ] || missing+=(chromium)
command -v curl >/dev/null 2>&1 || missing+=(curl)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(uname)" = Linux ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "==> installing ${missing[*]} for the tests (apt-get)"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
		{ apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; }
else
	echo "the tests need ${missing[*]}: install them (e.g. sudo apt-get install ${missing[*]}," \
		"or Google Chrome on macOS); the tests that use them fail without them" >&2
fi
exit 0
