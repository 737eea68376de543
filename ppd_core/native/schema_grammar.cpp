// llama.cpp's JSON-schema-to-GBNF converter (common/json-schema-to-grammar.cpp, the one llama-server applies to
// response_format), as a C function for ctypes. Built at set-up from the sdist of the installed llama-cpp-python
// (ppd_core/native/build.py), so a schema gives ppd the grammar llama-server gives it.
#include "json-schema-to-grammar.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

// The three string helpers the converter takes from common/common.cpp (the rest of which needs all of llama.cpp),
// with their behaviour there.
std::string string_join(const std::vector<std::string> & values, const std::string & separator) {
    std::ostringstream result;
    for (size_t i = 0; i < values.size(); ++i) {
        result << (i > 0 ? separator : "") << values[i];
    }
    return result.str();
}

std::vector<std::string> string_split(const std::string & text, const std::string & delimiter) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t end = text.find(delimiter); end != std::string::npos; end = text.find(delimiter, start)) {
        parts.push_back(text.substr(start, end - start));
        start = end + delimiter.length();
    }
    parts.push_back(text.substr(start));
    return parts;
}

std::string string_repeat(const std::string & text, size_t n) {
    std::string result;
    result.reserve(text.length() * n);
    for (size_t i = 0; i < n; ++i) {
        result += text;
    }
    return result;
}

// ggml's failed-assertion exit, which common/json.cpp calls (GGML_ASSERT): as in ggml, without linking it.
extern "C" void ggml_abort(const char * file, int line, const char * format, ...) {
    fprintf(stderr, "%s:%d: ", file, line);
    va_list args;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputc('\n', stderr);
    abort();
}

// GBNF for the JSON schema ``schema`` (JSON text), or NULL with ``*error`` set; free either with ppd_free.
extern "C" char * ppd_json_schema_to_grammar(const char * schema, char ** error) {
    try {
        return strdup(json_schema_to_grammar(common_json::parse(schema)).c_str());
    } catch (const std::exception & e) {
        *error = strdup(e.what());
        return nullptr;
    }
}

// GBNF for OpenAI's response_format with the JSON schema ``schema``, as llama-server builds it for a chat
// (common/chat-auto-parser-generator.cpp, after the generation prompt): the schema's JSON, bare or in a ```json
// fence, whitespace around it; the answer's content is the JSON alone.
extern "C" char * ppd_response_format_grammar(const char * schema, char ** error) {
    try {
        auto document = common_chat_schema_from_json(common_json::parse(schema));
        return strdup(build_grammar([&](const common_grammar_builder & builder) {
            auto json = builder.add_schema("response-format-schema", *document.root);
            builder.add_rule("root", "space (space (\"```json\" space " + json + " space \"```\" | space " + json +
                                     " space))");
        }).c_str());
    } catch (const std::exception & e) {
        *error = strdup(e.what());
        return nullptr;
    }
}

extern "C" void ppd_free(char * text) {
    free(text);
}
