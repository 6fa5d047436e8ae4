// A minimal JSON writer for the bench's result file (DESIGN.md §3 schema): objects, arrays, numbers,
// strings, booleans, with commas handled by the writer.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace epx::bench {

class JsonWriter {
 public:
  JsonWriter& begin_object(const char* key = nullptr) { return open(key, '{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array(const char* key = nullptr) { return open(key, '['); }
  JsonWriter& end_array() { return close(']'); }

  JsonWriter& field(const char* key, const std::string& value) {
    prefix(key);
    out_ += '"';
    for (char ch : value) {
      if (ch == '"' || ch == '\\') out_ += '\\';
      out_ += ch;
    }
    out_ += '"';
    return *this;
  }
  JsonWriter& field(const char* key, const char* value) { return field(key, std::string(value)); }
  JsonWriter& field(const char* key, bool value) {
    prefix(key);
    out_ += value ? "true" : "false";
    return *this;
  }
  JsonWriter& field(const char* key, double value) {
    prefix(key);
    char text[64];
    if (std::isfinite(value)) {
      std::snprintf(text, sizeof text, "%.3f", value);
    } else {
      std::snprintf(text, sizeof text, "null");
    }
    out_ += text;
    return *this;
  }
  JsonWriter& field(const char* key, long long value) {
    prefix(key);
    out_ += std::to_string(value);
    return *this;
  }
  JsonWriter& field(const char* key, int value) { return field(key, static_cast<long long>(value)); }

  const std::string& str() const { return out_; }

 private:
  JsonWriter& open(const char* key, char bracket) {
    prefix(key);
    out_ += bracket;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& close(char bracket) {
    first_.pop_back();
    out_ += '\n' + std::string(2 * first_.size(), ' ') + bracket;
    return *this;
  }
  void prefix(const char* key) {
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
      out_ += '\n' + std::string(2 * first_.size(), ' ');
    }
    if (key != nullptr) out_ += '"' + std::string(key) + "\": ";
  }

  std::string out_;
  std::vector<bool> first_;
};

}  // namespace epx::bench
