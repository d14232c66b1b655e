// Keeps the ops library within manylinux_2_28's libstdc++ (GLIBCXX <= 3.4.22, what
// torch's own libraries need).
//
// GCC 9 and later give std::ostringstream and std::stringstream a separate default
// constructor, exported by libstdc++ as GLIBCXX_3.4.26. torch's stable headers
// (headeronly/util/Exception.h, shim_utils.h) default-construct both, so every TU
// that checks a shim call refers to it. Instantiating the two constructors here lets
// the linker bind those references to these copies, and csrc/exports.map keeps them
// local, so the library neither needs the newer libstdc++ nor exports std symbols.
#include <sstream>

template std::basic_ostringstream<char>::basic_ostringstream();
template std::basic_stringstream<char>::basic_stringstream();
