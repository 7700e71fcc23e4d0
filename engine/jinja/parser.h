// engine/jinja/parser.h — tokens to a statement tree, as Jinja2's parser
// reads them (its operator precedence, filters and tests binding tighter than
// arithmetic). What Baton does not implement is refused here, naming the
// construct and its position, never at render time.
#pragma once

#include <vector>

#include "engine/jinja/ast.h"
#include "engine/jinja/lexer.h"

namespace baton::jinja {

Result<Body> parse(const std::vector<Token>& tokens);

}  // namespace baton::jinja
