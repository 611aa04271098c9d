export const PACKAGE_NAME = "@tapwire/reference-model";
