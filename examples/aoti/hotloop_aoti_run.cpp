// Runs an AOTInductor package (.pt2) that calls hotloop's ops, in a process without Python.
//
//   hotloop_aoti_run --ops LIBRARY --package MODEL.pt2 --inputs INPUTS.pt
//                    [--expected EXPECTED.pt] [--outputs OUTPUTS.pt] [--rtol R] [--atol A]
//
// LIBRARY is hotloop's compiled ops (`python -c "import hotloop; print(hotloop.library_path())"`
// on the machine that has the wheel; copy the file to the one that has none). Loading it runs
// hotloop's TORCH_LIBRARY registrations, so the package's calls to `hotloop::*` (made through
// AOTInductor's proxy executor, by op name) find their kernels. INPUTS and EXPECTED hold a list
// of tensors written by `torch.save` in Python (export_block.py writes them); the inputs are
// moved to the package's device. With --expected every output must match within rtol/atol, or
// the exit status is 1; --outputs writes them as a tuple of CPU tensors for `torch.load`.
#include <dlfcn.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/serialization/pickle.h>

namespace {

// RTLD_GLOBAL: the op library and the package's own shared object resolve torch's symbols
// from the same copies this program linked.
// RTLD_NOW: every symbol the library needs is bound here, so a library that wanted
// libpython (or a torch it was not built for) fails at load with the symbol's name.
constexpr int kOpsLibraryFlags = RTLD_NOW | RTLD_GLOBAL;

struct Options {
  std::string ops;
  std::string package;
  std::string inputs;
  std::optional<std::string> expected;
  std::optional<std::string> outputs;
  double rtol = 1e-4;
  double atol = 1e-5;
};

constexpr const char* kUsage =
    "usage: hotloop_aoti_run --ops LIBRARY --package MODEL.pt2 --inputs INPUTS.pt\n"
    "                        [--expected EXPECTED.pt] [--outputs OUTPUTS.pt] [--rtol R] "
    "[--atol A]\n";

double parse_tolerance(const std::string& name, const std::string& text) {
  size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(value >= 0)) {
    throw std::invalid_argument("--" + name + " takes a number >= 0, got '" + text + "'");
  }
  return value;
}

Options parse_options(int argc, char** argv) {
  std::map<std::string, std::string> values;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag.rfind("--", 0) != 0 || i + 1 >= argc) {
      throw std::invalid_argument("expected '--flag value' pairs but got '" + flag + "'");
    }
    values[flag.substr(2)] = argv[i + 1];
  }
  Options options;
  auto take = [&](const std::string& name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    std::string value = it->second;
    values.erase(it);
    return value;
  };
  auto require = [&](const std::string& name) {
    auto value = take(name);
    if (!value) throw std::invalid_argument("--" + name + " is required");
    return *value;
  };
  options.ops = require("ops");
  options.package = require("package");
  options.inputs = require("inputs");
  options.expected = take("expected");
  options.outputs = take("outputs");
  if (auto rtol = take("rtol")) options.rtol = parse_tolerance("rtol", *rtol);
  if (auto atol = take("atol")) options.atol = parse_tolerance("atol", *atol);
  if (!values.empty()) {
    throw std::invalid_argument("unknown option --" + values.begin()->first);
  }
  return options;
}

void load_ops_library(const std::string& path) {
  if (dlopen(path.c_str(), kOpsLibraryFlags) == nullptr) {
    throw std::runtime_error("could not load hotloop's op library " + path + ": " + dlerror() +
                             "\n  pass the file that `python -c \"import hotloop; "
                             "print(hotloop.library_path())\"` prints, built for this torch");
  }
  // The package names the ops it calls; without them it fails with a bare "Could not find
  // schema for hotloop::..." deep inside the loader.
  if (!c10::Dispatcher::singleton().findSchema({"hotloop::rms_norm", ""})) {
    throw std::runtime_error(path +
                             " loaded but registered no hotloop ops (no hotloop::rms_norm): "
                             "expected hotloop's op library");
  }
}

std::vector<at::Tensor> read_tensors(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot open " + path);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
  const c10::IValue value = torch::jit::pickle_load(bytes);
  // A list from torch.save([t0, t1, ...]), or a tuple as write_tensors saves them.
  c10::ArrayRef<c10::IValue> items;
  if (value.isList()) {
    items = value.toListRef();
  } else if (value.isTuple()) {
    items = value.toTupleRef().elements().asArrayRef();
  } else {
    throw std::runtime_error(path + " holds a " + value.tagKind() +
                             ", expected a list of tensors saved with torch.save([t0, t1, ...])");
  }
  std::vector<at::Tensor> tensors;
  for (const c10::IValue& item : items) {
    if (!item.isTensor()) {
      throw std::runtime_error(path + ": expected only tensors in the list, found a " +
                               item.tagKind());
    }
    tensors.push_back(item.toTensor());
  }
  return tensors;
}

void write_tensors(const std::string& path, const std::vector<at::Tensor>& tensors) {
  // A tuple: C++ lists pickle with a call that restores their element type
  // (torch.jit._pickle.*), which torch.load(weights_only=True) refuses.
  std::vector<c10::IValue> items;
  for (const at::Tensor& t : tensors) items.emplace_back(t.cpu());
  const std::vector<char> bytes =
      torch::jit::pickle_save(c10::ivalue::Tuple::create(std::move(items)));
  std::ofstream file(path, std::ios::binary);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!file) throw std::runtime_error("cannot write " + path);
}

// Prints one line per output; false when one differs from the expected tensor.
bool compare(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& expected,
             double rtol, double atol) {
  if (outputs.size() != expected.size()) {
    std::cerr << "the package returned " << outputs.size() << " outputs but " << expected.size()
              << " were expected\n";
    return false;
  }
  bool all_match = true;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor got = outputs[i].cpu();
    const at::Tensor& want = expected[i];
    if (got.sizes() != want.sizes() || got.dtype() != want.dtype()) {
      std::cerr << "output " << i << ": got " << got.sizes() << " " << got.dtype() << ", expected "
                << want.sizes() << " " << want.dtype() << "\n";
      all_match = false;
      continue;
    }
    const double max_diff = (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
    const bool match = at::allclose(got, want, rtol, atol);
    std::cout << "output " << i << ": " << got.sizes() << " " << got.dtype()
              << ", max |difference| " << max_diff << (match ? "" : "  MISMATCH") << "\n";
    all_match = all_match && match;
  }
  return all_match;
}

int run(const Options& options) {
  load_ops_library(options.ops);
  torch::inductor::AOTIModelPackageLoader loader(options.package);
  const std::string device = loader.get_metadata().at("AOTI_DEVICE_KEY");
  std::vector<at::Tensor> inputs = read_tensors(options.inputs);
  for (at::Tensor& t : inputs) t = t.to(c10::Device(device));

  const std::vector<at::Tensor> outputs = loader.run(inputs);
  std::cout << "ran " << options.package << " on " << device << ": " << outputs.size()
            << " output(s)\n";
  if (options.outputs) write_tensors(*options.outputs, outputs);
  if (!options.expected) return 0;
  if (!compare(outputs, read_tensors(*options.expected), options.rtol, options.atol)) {
    std::cerr << "outputs differ from " << *options.expected << " (rtol " << options.rtol
              << ", atol " << options.atol << ")\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "hotloop_aoti_run: " << e.what() << "\n" << kUsage;
    return 2;
  }
  try {
    return run(options);
  } catch (const c10::Error& e) {
    std::cerr << "hotloop_aoti_run: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "hotloop_aoti_run: " << e.what() << "\n";
    return 1;
  }
}
