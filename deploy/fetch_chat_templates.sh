#!/usr/bin/env bash
# Fetches the chat templates of real checkpoints that chat_template_test.py
# renders: the ~70 templates llama.cpp keeps in models/templates/ (copied from
# the checkpoints' tokenizer_config.json files), as the llama-cpp-python sdist
# on PyPI vendors them. Pinned version, verified by the sdist's SHA-256; only
# the templates are unpacked, into .deps/ (ignored by git). Idempotent.
# Exit status 0 with a warning when PyPI cannot be reached: the test then
# skips and says why.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
url=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$version.tar.gz
dest=.deps/chat-templates-$version
if [ -f "$dest/.complete" ]; then
  echo "fetch_chat_templates: llama.cpp's templates (llama-cpp-python $version) present"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! curl -fsSL --retry 3 -o "$work/sdist.tar.gz" "$url"; then
  echo "WARNING: fetch_chat_templates: could not fetch llama-cpp-python $version; the chat" \
    "template test will skip" >&2
  exit 0
fi
if ! echo "$sha256  $work/sdist.tar.gz" | sha256sum -c --quiet -; then
  echo "fetch_chat_templates: llama-cpp-python $version does not match its pinned SHA-256" >&2
  exit 1
fi
tar -xzf "$work/sdist.tar.gz" -C "$work" --wildcards '*/vendor/llama.cpp/models/templates/*.jinja'
rm -rf "$dest"
mkdir -p "$dest"
cp "$work"/*/vendor/llama.cpp/models/templates/*.jinja "$dest/"
touch "$dest/.complete"
echo "fetch_chat_templates: $(ls "$dest" | wc -l) templates in $dest/"
