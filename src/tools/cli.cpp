#include "attention2d/tools/cli.hpp"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "attention2d/error.hpp"

namespace a2d::cli {
namespace {

int64_t parse_int(const std::string& option, const std::string& text) {
  std::size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  A2D_REQUIRE(used == text.size() && !text.empty(), option, " expects an integer, got '", text,
              "'");
  return value;
}

double parse_double(const std::string& option, const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  A2D_REQUIRE(used == text.size() && !text.empty(), option, " expects a number, got '", text, "'");
  return value;
}

std::string escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
      out += buffer;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

Options::Options(std::string usage, std::string summary)
    : usage_(std::move(usage)), summary_(std::move(summary)) {}

void Options::add_int(const std::string& name, int64_t* target, const std::string& help) {
  options_.push_back({name, help, std::to_string(*target), true,
                      [name, target](const std::string& v) { *target = parse_int(name, v); }});
}

void Options::add_double(const std::string& name, double* target, const std::string& help) {
  options_.push_back({name, help, format_double(*target, 6), true,
                      [name, target](const std::string& v) { *target = parse_double(name, v); }});
}

void Options::add_string(const std::string& name, std::string* target, const std::string& help) {
  options_.push_back({name, help, *target, true, [target](const std::string& v) { *target = v; }});
}

void Options::add_flag(const std::string& name, bool* target, const std::string& help) {
  options_.push_back({name, help, "", false, [target](const std::string&) { *target = true; }});
}

const Options::Option* Options::find(const std::string& name) const {
  for (const Option& option : options_) {
    if (option.name == name) return &option;
  }
  return nullptr;
}

bool Options::parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << help();
      return false;
    }
    std::string value;
    bool inline_value = false;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    const Option* option = find(arg);
    A2D_REQUIRE(option, "unknown option '", arg, "'; run '", usage_.substr(0, usage_.find(" [")),
                " --help' for the list");
    if (option->takes_value) {
      if (!inline_value) {
        A2D_REQUIRE(i + 1 < argc, arg, " needs a value");
        value = argv[++i];
      }
    } else {
      A2D_REQUIRE(!inline_value, arg, " takes no value");
    }
    option->set(value);
    given_.push_back(arg);
  }
  return true;
}

bool Options::given(const std::string& name) const {
  for (const auto& g : given_) {
    if (g == name) return true;
  }
  return false;
}

std::string Options::help() const {
  std::ostringstream out;
  out << "usage: " << usage_ << "\n\n" << summary_ << "\n\noptions:\n";
  for (const Option& option : options_) {
    std::string left = "  " + option.name + (option.takes_value ? " VALUE" : "");
    if (left.size() < 24)
      left.resize(24, ' ');
    else
      left += "\n" + std::string(24, ' ');
    out << left << option.help;
    if (option.takes_value && !option.default_text.empty()) {
      out << " (default " << option.default_text << ")";
    }
    out << "\n";
  }
  out << "  --help                this text\n";
  return out.str();
}

JsonLine& JsonLine::add(const std::string& key, const std::string& value) {
  fields_.emplace_back(key, "\"" + escape(value) + "\"");
  return *this;
}

JsonLine& JsonLine::add(const std::string& key, const char* value) {
  return add(key, std::string(value));
}

JsonLine& JsonLine::add(const std::string& key, int64_t value) {
  fields_.emplace_back(key, std::to_string(value));
  return *this;
}

JsonLine& JsonLine::add(const std::string& key, double value) {
  fields_.emplace_back(key, std::isfinite(value) ? format_double(value, 6) : "null");
  return *this;
}

JsonLine& JsonLine::add(const std::string& key, bool value) {
  fields_.emplace_back(key, value ? "true" : "false");
  return *this;
}

std::string JsonLine::str() const {
  std::string out = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i) out.append(", ");
    out.append(1, '"').append(escape(fields_[i].first)).append("\": ").append(fields_[i].second);
  }
  return out.append(1, '}');
}

std::string format_double(double value, int precision) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*g", precision, value);
  return buffer;
}

}  // namespace a2d::cli
