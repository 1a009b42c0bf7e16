#include "common/private_directory.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace cserps {

absl::Status CreateParentDirectory(const std::string& path) {
  const std::filesystem::path target(path);
  if (!target.has_parent_path()) return absl::OkStatus();
  std::error_code error;
  const bool created = std::filesystem::create_directories(target.parent_path(), error);
  if (error) {
    return absl::Status(absl::ErrnoToStatusCode(error.value()),
                        absl::StrCat(path, ": create_directories(",
                                     target.parent_path().string(), "): ", error.message()));
  }
  if (created) {
    std::filesystem::permissions(target.parent_path(), std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, error);
    if (error) {
      return absl::Status(absl::ErrnoToStatusCode(error.value()),
                          absl::StrCat(path, ": chmod 0700 ", target.parent_path().string(),
                                       ": ", error.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace cserps
