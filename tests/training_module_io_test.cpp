// Any module's parameters to a safetensors file and back; a file that does not fit is refused and changes nothing.
#include <doctest/doctest.h>

#include "models/checkpoint.hpp"
#include "models/gpt.hpp"
#include "models/layers.hpp"
#include "training_test_util.hpp"

using namespace tapegrad;

TEST_CASE("a module's parameters round-trip through a safetensors file exactly") {
  testing::ScratchDir dir;
  MLP saved("mlp", {3, 8, 2}, 1), loaded("mlp", {3, 8, 2}, 2);
  CHECK(saved.parameters()[0].value.to_vector() != loaded.parameters()[0].value.to_vector());
  save_parameters(dir.file("mlp.safetensors"), saved, {{"note", "a toy"}});
  CHECK(dir.entries() == std::vector<std::string>{"mlp.safetensors"});  // written atomically: no temporary left
  load_parameters(dir.file("mlp.safetensors"), loaded);
  for (size_t k = 0; k < saved.parameters().size(); ++k)
    CHECK(loaded.parameters()[k].value.to_vector() == saved.parameters()[k].value.to_vector());
  CHECK(load_checkpoint(dir.file("mlp.safetensors")).metadata.at("note") == "a toy");
}

TEST_CASE("a GPT's parameters round-trip under nanoGPT's names") {
  testing::ScratchDir dir;
  GPTConfig cfg;
  cfg.n_layer = 1;
  cfg.n_embd = 16;
  cfg.n_head = 2;
  cfg.block_size = 8;
  GPT a(cfg, 1), b(cfg, 2);
  save_parameters(dir.file("gpt.safetensors"), a);
  load_parameters(dir.file("gpt.safetensors"), b);
  CHECK(b.parameter("transformer.h.0.attn.c_attn.weight").value.to_vector() ==
        a.parameter("transformer.h.0.attn.c_attn.weight").value.to_vector());
}

TEST_CASE("loading into a module whose names or shapes differ lists the differences and changes nothing") {
  testing::ScratchDir dir;
  MLP saved("mlp", {3, 8, 2}, 1);
  save_parameters(dir.file("mlp.safetensors"), saved);

  MLP wider("mlp", {4, 8, 2, 5}, 2);  // mlp.0.weight (8, 4); mlp.2.* missing from the file
  const std::vector<double> before = wider.parameters()[0].value.to_vector();
  const std::vector<double> bias_before = wider.parameters()[1].value.to_vector();
  CHECK_THROWS_WITH_AS(load_parameters(dir.file("mlp.safetensors"), wider),
                       doctest::Contains("into module 'mlp': 2 missing from the file: mlp.2.weight, mlp.2.bias; "
                                         "1 of another shape: mlp.0.weight is float32 (8, 3) in the file, float32 "
                                         "(8, 4) in the module; nothing was loaded"),
                       Error);
  CHECK(wider.parameters()[0].value.to_vector() == before);
  CHECK(wider.parameters()[1].value.to_vector() == bias_before);  // mlp.0.bias fits, and was not loaded either

  MLP renamed("net", {3, 8, 2}, 2);
  const std::vector<double> renamed_before = renamed.parameters()[0].value.to_vector();
  CHECK_THROWS_WITH_AS(load_parameters(dir.file("mlp.safetensors"), renamed),
                       doctest::Contains("4 unexpected (the module has no such parameter): mlp.0.weight, mlp.0.bias, "
                                         "mlp.1.weight, mlp.1.bias"),
                       Error);
  CHECK(renamed.parameters()[0].value.to_vector() == renamed_before);
}
