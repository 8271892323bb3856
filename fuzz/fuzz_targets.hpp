// The bodies of the libFuzzer targets, shared with the regression test that replays the seed corpus and every
// input a fuzzer once crashed on (tests/reliability_fuzz_test.cpp).
//
// Each takes arbitrary bytes and may fail only with a tapegrad::Error (the config target also with CLI11's parse
// errors, which the program reports the same way). Anything else is a finding: another exception escaping, a
// crash, a sanitizer report, or a broken invariant, which aborts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tapegrad::fuzz {

// The checkpoint loader as `tapegrad sample --checkpoint` runs it: parse, the model its metadata describes, its
// vocabulary, and one forward pass of the model.
int checkpoint_input(const uint8_t* data, size_t size);

// A `tapegrad train --config FILE` file: the CLI11 INI reader, the train subcommand's options parsed from it, and
// the configuration's own checks.
int config_input(const uint8_t* data, size_t size);

// The text and vocabulary loader: TextData::from_text, with encode, decode and batches checked against the text.
int text_input(const uint8_t* data, size_t size);

// The formula language: the text parsed as one formula, its shape checked and the formula evaluated in float64 on
// (2, 3) inputs for every name it reads; then the same text parsed as a file of claims (tapegrad claim --file), each
// claim's formulas checked against its inputs' shapes where they are small.
int formula_input(const uint8_t* data, size_t size);

}  // namespace tapegrad::fuzz
