#!/usr/bin/env bash
# Fails if MEMBER of ARCHIVE (an object compiled for a narrower instruction
# set than its neighbours) holds any of the MNEMONICS, or holds none of
# EXPECTED (the pass itself, so an empty or renamed object cannot pass).
#
#   object_instructions.sh OBJDUMP ARCHIVE MEMBER EXPECTED MNEMONIC...
set -euo pipefail
objdump=$1 archive=$2 member=$3 expected=$4
shift 4
disassembly=$("$objdump" -d --no-show-raw-insn "$archive" |
  awk -v m="$member:" '/file format/ { on = ($1 == m) } on')
if [ -z "$disassembly" ]; then
  echo "no member $member in $archive" >&2
  exit 1
fi
if ! grep -qw "$expected" <<<"$disassembly"; then
  echo "$member holds no $expected: not the pass this test looks for" >&2
  exit 1
fi
pattern=$(IFS='|'; echo "$*")
found=$(grep -Eow "$pattern" <<<"$disassembly" | sort | uniq -c || true)
if [ -n "$found" ]; then
  echo "$member holds instructions outside its target:" >&2
  echo "$found" >&2
  exit 1
fi
echo "$member: $(wc -l <<<"$disassembly") lines, none of: $*"
