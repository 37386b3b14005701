// The training job's schema: every key prints with its default and doc, and mistakes are named.
#include <gtest/gtest.h>

#include "core/config.h"
#include "engine/trainer.h"

namespace tessera::engine {
namespace {

TEST(TrainSchema, PrintsEveryKeyWithItsDefault) {
  const core::Schema schema = train_schema();
  core::Config config(schema);
  const std::string yaml = config.to_yaml();
  for (const core::KeySpec& key : schema.keys()) {
    const std::string leaf = key.path.substr(key.path.rfind('.') + 1);
    EXPECT_NE(yaml.find(leaf + ":"), std::string::npos) << key.path << " missing from\n" << yaml;
  }
  EXPECT_NE(yaml.find("architecture: compact"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("milestones: []"), std::string::npos) << "an empty list prints as []\n" << yaml;
}

}  // namespace
}  // namespace tessera::engine
