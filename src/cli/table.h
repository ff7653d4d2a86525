// A plain text table for command output: columns sized to their widest cell.
#pragma once

#include <string>
#include <vector>

namespace strata::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Renders with two spaces between columns and a rule under the header.
  std::string Render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace strata::cli
