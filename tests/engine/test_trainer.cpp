// The training job's schema: every key prints with its default and doc, and mistakes are named.
#include <gtest/gtest.h>

#include "engine/trainer.h"
#include "io/config.h"

namespace tessera::engine {
namespace {

TEST(TrainSchema, PrintsEveryKeyWithItsDefault) {
  const io::Schema schema = train_schema();
  io::Config config(schema);
  const std::string yaml = config.to_yaml();
  for (const io::KeySpec& key : schema.keys()) {
    const std::string leaf = key.path.substr(key.path.rfind('.') + 1);
    EXPECT_NE(yaml.find(leaf + ":"), std::string::npos) << key.path << " missing from\n" << yaml;
  }
  EXPECT_NE(yaml.find("architecture: compact"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("milestones: []"), std::string::npos) << "an empty list prints as []\n" << yaml;
}

}  // namespace
}  // namespace tessera::engine
