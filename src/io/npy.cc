#include "io/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "core/checked.h"
#include "io/json.h"

namespace klinear {

Status write_npy(const std::string& path, const Tensor& t) {
  KL_CHECK(t.dtype() == DType::kF32 && t.device() == Device::kCpu, "write_npy needs a host F32 tensor");
  std::string shape = "(";
  for (int i = 0; i < t.rank(); ++i) shape += std::to_string(t.dim(i)) + (t.rank() == 1 || i + 1 < t.rank() ? "," : "");
  shape += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IOError(path + ": cannot open for writing");
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.nbytes()));
  out.close();
  if (!out) return Status::IOError(path + ": write failed");
  return Status();
}

Result<Tensor> read_npy(const std::string& path) {
  KL_ASSIGN_OR_RETURN(std::string bytes, read_regular_file(path, kMaxNpyFileBytes));
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0 || bytes[6] != 1)
    return Status::Corruption(path + ": not a version 1 .npy file");
  const size_t hlen = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
  if (10 + hlen > bytes.size()) return Status::Corruption(path + ": header runs past the end of the file");
  const std::string header = bytes.substr(10, hlen);
  if (header.find("'<f4'") == std::string::npos || header.find("False") == std::string::npos)
    return Status::NotSupported(path + ": only little-endian float32 C-order arrays are read, header " + header);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex(R"('shape':\s*\(([^)]*)\))")))
    return Status::Corruption(path + ": no shape in header " + header);
  Shape shape;
  const std::string dims = m[1];
  const std::regex digits(R"(\d+)");
  int64_t nbytes = 4;  // checked before anything is allocated
  for (std::sregex_iterator it(dims.begin(), dims.end(), digits), end; it != end; ++it) {
    KL_ASSIGN_OR_RETURN(int64_t d, parse_int(it->str(), IntRange{0, kMaxNpyFileBytes}, path + ": shape entry"));
    KL_ASSIGN_OR_RETURN(nbytes, checked_mul(nbytes, d, path + ": shape " + dims));
    shape.push_back(d);
  }
  if (static_cast<int64_t>(bytes.size() - 10 - hlen) != nbytes)
    return Status::Corruption(path + ": data is " + std::to_string(bytes.size() - 10 - hlen) + " bytes, shape " +
                              shape_to_string(shape) + " needs " + std::to_string(nbytes));
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::memcpy(t.data(), bytes.data() + 10 + hlen, t.nbytes());
  return t;
}

}  // namespace klinear
