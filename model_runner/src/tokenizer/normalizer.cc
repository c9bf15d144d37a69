#include "normalizer.h"

#include "unicode_nfc.h"

namespace omni::models {

Normalizer::Normalizer(const std::optional<JsonField>& field) {
  if (field) add(*field);
}

void Normalizer::add(const JsonField& field) {
  const std::string type = field.get("type").string();
  if (type == "NFC") {
    nfc_ = true;
  } else if (type == "Sequence") {
    for (const JsonField& step : field.get("normalizers").items()) add(step);
  } else {
    field.get("type").fail("unsupported normalizer '" + type + "' (supported: NFC, Sequence)");
  }
}

std::string Normalizer::normalize(const std::string& text) const { return nfc_ ? nfc(text) : text; }

}  // namespace omni::models
